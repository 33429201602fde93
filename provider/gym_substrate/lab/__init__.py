"""The operator's lab: experiments (`compare`, `ladder`, probes), benchmarks and tools (smoke,
sweep, fuzz). It drives the provider, the local backend and the Gymnasium env from outside,
through their public modules, and nothing but the CLI imports it.
"""
