"""Sandbox backends: turn a policy into a confined process."""
