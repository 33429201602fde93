"""Operator tools behind the `gym-substrate` command line (smoke, sweep), as libraries; the
click code is in `gym_substrate.cli`, benchmarks in `gym_substrate.lab.bench`."""
