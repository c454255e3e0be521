"""``python -m hwgen.cli``: the ``hwgen`` command."""

from . import main

main()
