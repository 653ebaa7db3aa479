"""The user's side of servebench: the `bench` command."""
