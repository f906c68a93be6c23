"""Packages for the wheel: every package under harness/ is found, never listed by hand (so no sub-package can be
left out of the wheel), plus the folders that pyproject.toml's package-dir maps in by name."""

from pathlib import Path

from setuptools import find_packages, setup

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PACKAGE_DIR = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
MAPPED = [name for name in PACKAGE_DIR if name]  # attnbench.variants, attnbench.configs

setup(packages=find_packages(PACKAGE_DIR[""]) + MAPPED)
