"""What a model call leaves behind: the turn, its token arrays, the rollout graph and its prefix
index, validation, interned messages, the call's recording and the exports.
"""
