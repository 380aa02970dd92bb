"""``python -m rabbitretry``: the same command line as ``rabbitretry``."""

from rabbitretry.cli import main

if __name__ == "__main__":
    main()
