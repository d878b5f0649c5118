"""The hoster's commands (`licensectl run | status | rollout | keys | config-reference`).

The top layer: may import everything below it. Commands other than `run` talk to the apiserver or to
the controller's status endpoint once and exit; stdout is the command's output, logs go to stderr.
"""
