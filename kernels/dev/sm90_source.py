# fwd_sm90's template text without the knob prelude, assembled as
# kernels/templates/sm90/parts.cc's FwdSm90Parts() does (the part list is read
# from there, so it lives in one place). For the dev scripts, which prepend
# their own #defines; on a machine with a build,
# `kforge-kernels-compile --text fwd_sm90` prints the same text.
import os, re

TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")


def fwd_sm90_text():
    cc = open(os.path.join(TEMPLATES, "sm90", "parts.cc")).read()
    body = cc[cc.index("FwdSm90Parts()"):]
    body = body[:body.index("};")]
    names = re.findall(r'\{"([^"]+)", embedded::\w+\}', body)
    assert names and names[-1] == "fwd_sm90.cuh", names
    return "".join(open(os.path.join(TEMPLATES, n)).read() for n in names)


if __name__ == "__main__":
    print(fwd_sm90_text(), end="")
