"""mkdocs hook: build the site from docs/ itself (the folder holding mkdocs.yml).

mkdocs refuses a ``docs_dir`` equal to the config file's folder; the config names a
subfolder and this hook widens it, once the config is validated, to that folder.
"""

import os


def on_config(config):
    config.docs_dir = os.path.dirname(os.path.abspath(config.config_file_path))
    return config
