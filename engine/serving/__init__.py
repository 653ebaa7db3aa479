"""Serving the engine: the async engine thread, the OpenAI-compatible aiohttp server, request
parsing, streaming and Prometheus metrics."""
