"""`bench claims`: the serving folklore (paging, continuous batching, chunked prefill, FP8, fused
kernels, sharing and priority) measured on the user's own hardware, each claim an ordinary sweep
under the claims folder with a verdict against the brief's own numbers."""
