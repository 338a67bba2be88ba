"""Streaming inference: attention kernels, the KV cache, and the chunked engine."""
