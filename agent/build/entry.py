"""PyInstaller entry point of the static build: the same `main()` as the console script."""

from sandbox_agent.__main__ import main

if __name__ == "__main__":
    main()
