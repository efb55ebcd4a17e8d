"""placeholder"""
import dataclasses
@dataclasses.dataclass
class Splits:
    pass
