"""Building a candidate's extensions on the trusted side: what it asks for, read from its text
(`static_builds`), built by a child that runs no candidate code (`trusted_builds`), ahead of the
evaluation on a CPU pool (`prebuild`), for the architectures of this machine's GPU (`build_arch`).
The child's own build code (the cache, compiler errors) lives in `engine/child/`, which imports
only torch, the standard library and `core`.
"""
