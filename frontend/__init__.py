"""The workbench's web pages: jinja2 templates and static JS/CSS (no build step).

`frontend.pages.router` serves the HTML pages and two small read-only proxies to the
inference server; `frontend.pages.mount_static(app)` serves `frontend/static/` at /static.
Everything else the pages show comes from the workbench's JSON API under /api.
"""
