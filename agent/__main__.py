"""Entry for ``python -m agent`` and for the zipapp."""

from agent.cli import main

if __name__ == "__main__":
    main()
