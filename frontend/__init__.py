"""The workbench's web pages: jinja2 templates and static JS/CSS (no build step).

`frontend.pages.install(app, replay_runs=...)` serves the HTML pages, `frontend/static/` at
/static and a small read-only proxy to the inference server. Everything else the pages show
comes from the workbench's JSON API under /api. The app serves the frontend; the frontend
never imports the app (tests/test_import_direction.py).
"""
