"""A real SGLang server on this machine's CPU, laid out like the simulated host (`optagent sim up --real`).

`environment` sets up and caches what it runs on (a Python 3.11 venv with torch, SGLang 0.5.23 and its
CPU kernels, and a tiny Llama built locally); `layout` lays out the host directory and its unit file.
"""
