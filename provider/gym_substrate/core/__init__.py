"""What every product of the distribution shares: Substrate's names and the error base.

`gym_substrate.core` and the wire stubs (`gym_substrate.ateapi`) import nothing else of ours;
the provider (`nemo`), the local backend (`local`), the stack model (`stack`), the Gymnasium
env (`envs`), the operator lab (`lab`) and the CLI build on them (tests/test_layers.py).
"""
