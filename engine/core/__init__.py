"""What decides: requests and their states, the KV block pool and manager, the scheduler.
Nothing here touches a tensor."""
