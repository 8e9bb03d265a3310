"""Stage 7, report: the Markdown/HTML study report with plots (matplotlib imported lazily:
``pip install 'autotune[report]'``).

May import: every stage below (``core`` .. ``trust``).
"""
