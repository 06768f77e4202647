"""The worker process the ``mlafuzz`` executable starts for a ``python:`` backend.

    python -m mlafuzz._worker --backend SPEC --shm-fd FD [--arena-fd FD] [--protocol 3]

It loads the kernel named by SPEC (``path/to/file.py:func`` or ``package.module:func``), then
serves requests framed on stdin and answers on stdout (docs/WORKER_PROTOCOL.md); the arrays of
each call live in the shared memory passed as --shm-fd, or (inputs) in mlafuzz's shared arena
passed read-only as --arena-fd. Anything the kernel prints goes to stderr.
People do not start it; ``mlafuzz`` does.

Modules: protocol (frames, RUN requests), loader (the kernel and its mutants), shm (the shared
memory and arena mappings), device_cache (device copies kept across calls), driver (the CUDA
driver API through ctypes), timing (MLAFUZZ_WORKER_TIMING), server (the calls and main).
"""
