"""The trainers' one checkpoint format: the atomic, checksummed file (``format``), the spaces as
plain data (``spaces``), and the versioned layout with one section per family (``writer`` and
``reader``)."""
