"""jinja2 templates of the vendor files, installed as the data package ``hwgen.rtl_templates``.

``pyproject.toml`` maps this folder there; :data:`hwgen.flow.package.TEMPLATES_DIR` finds it
through :func:`importlib.resources.files`, from a checkout and from an installed wheel alike.
"""
