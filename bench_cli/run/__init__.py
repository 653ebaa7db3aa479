"""`bench run`: one run from a profile and flags (execute), what it starts or prints around the
load (tokenizer_choice, sim_progress, explain), the vLLM-format result (vllm_json), and how a
signal ends it (interrupts)."""
