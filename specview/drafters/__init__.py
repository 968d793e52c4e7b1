"""Drafters that are not a separate model: views of the target that guess its next tokens more cheaply."""
