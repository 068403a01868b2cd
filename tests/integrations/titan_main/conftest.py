"""The TorchTitan main tests: collected only where TorchTitan main is installed.

``make test-titan-main`` runs this folder in the second virtualenv (``.venv-titan-main``);
in the 0.3.0 venv every module here is reported as skipped, naming that target.
"""
