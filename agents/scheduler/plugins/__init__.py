"""The in-tree plugins, one module (or folder) each, registered in `framework.registry`."""
