"""What the target is: its model (config.json) and its GPUs (nvidia-smi), read through a transport."""
