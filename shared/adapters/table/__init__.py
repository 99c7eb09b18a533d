"""The ports on Azure Table Storage: the state table's rows, stores and the helpers they
share.
"""
