"""A griffe extension for the API reference: read ``Example:`` sections as examples.

Our Google docstrings title their doctests ``Example:`` (singular, as Napoleon accepts); griffe's
Google parser only knows ``Examples:`` and would render the ``>>>`` lines as Markdown quotes.
Loaded by mkdocs.yml (``extensions: [docs/griffe_examples.py:ExampleSections]``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` section titles to ``Examples:`` in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
