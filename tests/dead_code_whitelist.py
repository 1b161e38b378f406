"""Names in course_utils that only a framework uses, for tests/test_dead_code.py (vulture reads
this file as code: each line "uses" a name)."""
_ = object()
_._repr_html_          # Jupyter calls it to show an object as HTML
_.flags.writeable      # NumPy reads the flag the package writes
_.__getattr__          # a module's lazy attributes (PEP 562): tools/ and grading/ __init__
_._default_transport   # traitlets' dynamic defaults (grading/kernels.py)
_._default_ip
_.forward              # torch.nn.Module calls it
_._recreate_cm         # contextlib.ContextDecorator calls it for each decorated call
_.leave                # tqdm reads it when the bar closes
