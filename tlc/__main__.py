"""`python -m tlc …` runs the `tlc` command (for environments where the script is not on PATH)."""
import sys

from tlc.cli import main

sys.exit(main())
