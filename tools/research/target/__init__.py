"""What the target is: its model (config.json), its GPUs (nvidia-smi) or, for SGLang's CPU engine,
its CPU host (memory, NUMA, arch), read through a transport."""
