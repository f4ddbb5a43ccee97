"""disagg operator: API models, rendering and kopf handlers."""
