"""A simulated engine: the real scheduler, KV cache manager, prefix cache and preemption, with
the model's forward pass replaced by a step-time model on a virtual clock. For hardware and
scales this machine cannot run (`bench run --engine sim`)."""
