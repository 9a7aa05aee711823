"""Test stand-in for vLLM (see test/kvd/py/fake_vllm/README)."""
