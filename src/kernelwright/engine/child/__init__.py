"""The evaluation child: runs one candidate against its reference in its own process.

Everything under this package imports only torch and the standard library (and
`kernelwright.core.config` / `kernelwright.core.record`, which are standard library only),
so the child runs on any GPU box as it is.
"""
