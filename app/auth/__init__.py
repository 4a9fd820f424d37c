"""Who may use the workbench: the operator token, its session cookie, the request guard and the
sign-in pages (docs/security.md)."""
