"""Sphinx configuration: the guides in docs/*.md (MyST) and an API reference from docstrings.

Build: python -m sphinx -W --keep-going -b html docs docs/_build/html
(tests/test_docs_site.py runs the same build with warnings as errors).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import nanopy

project = "nanopy"
author = "the nanopy contributors"
copyright = "2026, the nanopy contributors"
release = nanopy.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: "## Heading" gets an anchor, so [text](api.md#threads-tasks-and-the-engine) works.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The state diagrams of protocols.md are ```mermaid fences (drawn from the protocol
# tables by nanopy.protocols._diagram; GitHub renders them as they are). With
# sphinxcontrib-mermaid (docs extra) they are diagrams here too; without it they
# show as their source, next to the transition table that follows each one.
MERMAID = importlib.util.find_spec("sphinxcontrib.mermaid") is not None
if MERMAID:
    extensions.append("sphinxcontrib.mermaid")
    myst_fence_as_directive = ["mermaid"]

# Docstrings are Google style (Args:, Returns:, Raises:); Socket's "Options:" section
# is generated from the option table and reads like a parameter list.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True
napoleon_custom_sections = [("Options", "params_style")]

autodoc_member_order = "groupwise"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": False}
# Spark's data source classes import pyspark; the reference documents the driver-side API.
autodoc_mock_imports = ["pyspark", "pyarrow"]

html_theme = "alabaster"
html_title = f"nanopy {release}"
html_static_path: list[str] = []


def setup(app: Any) -> None:
    if not MERMAID:
        from pygments.lexers.special import TextLexer

        app.add_lexer("mermaid", TextLexer)  # plain text, and no "unknown lexer" warning
