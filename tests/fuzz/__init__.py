"""A mutation fuzzer for adapterprobe's readers (see CONTRIBUTING.md, "Fuzzing").

Seeds are real files written by the real libraries; each case runs in a
worker process under a memory limit and a timeout; bug cases are saved for
replay. Run ``python -m tests.fuzz --help``.
"""
