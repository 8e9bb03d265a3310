"""autotune's SQL: the schema migrations (``migrations/``) and the SRE report queries (``reports/``).

This folder is the repository's top-level ``sql/``; pyproject's ``package-dir`` installs it as the
package ``autotune._sql`` so that a wheel or an editable install finds the files through
importlib.resources. Nothing here is Python beyond this file.
"""
