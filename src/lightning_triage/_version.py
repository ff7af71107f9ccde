"""The package's version, in a leaf module: whatever needs it (the report's ``run`` section, the
command line's ``--version``) reads it here without importing the package's ``__init__``."""

__version__ = "0.1.0.dev0"
