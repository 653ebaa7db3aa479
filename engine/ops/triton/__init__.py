"""Triton kernels with the same signatures as the torch reference ops beside them in
engine/ops (the CUDA path; tested on CPU in Triton's interpreter against that reference)."""
