"""Tensor parallelism: the model's weights split across N processes (ranks) that run every
step together, Megatron-style: column-parallel QKV and gate/up (each rank its heads and its
slice of the MLP), row-parallel O and down followed by an all-reduce, a vocab-parallel
embedding and LM head (the logits gathered on rank 0 for sampling). The scheduler, KV block
manager and sampler stay in the driver (rank 0, the engine's own process); each rank holds
the KV cache of its own heads. Collectives go through torch.distributed (gloo on CPU, NCCL
on CUDA)."""
