"""Operator tools behind the `gym-substrate` command line: smoke, bench, sweep."""
