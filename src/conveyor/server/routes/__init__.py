"""One module per resource; each exposes ``router(ctx) -> APIRouter``."""
