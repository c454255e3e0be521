"""Board files, installed as the data package ``hwgen.board_files``.

``pyproject.toml`` maps this folder there; :data:`hwgen.boards.BOARDS_DIR` finds it through
:func:`importlib.resources.files`, from a checkout and from an installed wheel alike.
"""
