"""`python -m docembed ...` (and `torchrun ... -m docembed train-...`) runs the docembed command."""

from docembed.cli import main

if __name__ == "__main__":
    main()
