"""The scheduling framework: contracts (`interface`), statuses, the plugin registry, profiles
from YAML, and the runtime that runs a profile's plugins over the shared cluster state."""
