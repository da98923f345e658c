"""Helpers the tests share, each module named by what it provides.

Test files and conftest.py files import them from here (`from tests.support.ports import
free_port`); conftest.py files hold fixtures only, and nothing imports from a conftest.py.
"""
