#!/bin/sh
# Make bubblewrap available on a host without it and without network (the GPU machines), from the
# Debian packages kept in .deb/ (git-ignored; fetched once on a machine with apt:
#   mkdir -p .deb && cd .deb && apt-get download bubblewrap libcap2 libselinux1 libpcre2-8-0).
# Unpacks into /tmp/bw (never into /) and puts bwrap on PATH. Use it sourced, so PATH stays set:
#   . scripts/install_bwrap_deb.sh && bwrap --version
# The libraries (libcap2, libselinux1 and its libpcre2-8) are unpacked too, and used only by bwrap
# itself (a wrapper sets LD_LIBRARY_PATH for it, then bwrap clears it for the sandboxed child)
# only where the host lacks them. bwrap needs unprivileged user namespaces, or root.
KW_BW=${KW_BW:-/tmp/bw}
KW_DEBS=${KW_DEBS:-$(pwd)/.deb}
if command -v bwrap >/dev/null 2>&1; then
    echo "bwrap already on PATH: $(command -v bwrap)"
else
    set -- "$KW_DEBS"/bubblewrap_*.deb
    if [ ! -f "$1" ]; then
        echo "no $KW_DEBS/bubblewrap_*.deb: fetch it on a machine with apt (see the top of this script) and carry .deb" >&2
        return 1 2>/dev/null || exit 1
    fi
    mkdir -p "$KW_BW"
    dpkg -x "$1" "$KW_BW"
    if [ -n "${KW_BW_OWN_LIBS:-}" ] || ldd "$KW_BW/usr/bin/bwrap" | grep -q "not found"; then
        for f in "$KW_DEBS"/libcap2_*.deb "$KW_DEBS"/libselinux1_*.deb "$KW_DEBS"/libpcre2-8-0_*.deb; do
            [ -f "$f" ] && dpkg -x "$f" "$KW_BW/deps"
        done
        mkdir -p "$KW_BW/bin"
        libs="$KW_BW/deps/lib/x86_64-linux-gnu:$KW_BW/deps/usr/lib/x86_64-linux-gnu"
        # bwrap runs with its own libraries; the child it starts gets the caller's LD_LIBRARY_PATH back
        printf '#!/bin/sh\nif [ -n "${LD_LIBRARY_PATH+x}" ]; then set -- --setenv LD_LIBRARY_PATH "$LD_LIBRARY_PATH" "$@"; else set -- --unsetenv LD_LIBRARY_PATH "$@"; fi\nLD_LIBRARY_PATH=%s exec %s "$@"\n' \
            "$libs" "$KW_BW/usr/bin/bwrap" > "$KW_BW/bin/bwrap"
        chmod +x "$KW_BW/bin/bwrap"
        export PATH="$KW_BW/bin:$PATH"
    else
        export PATH="$KW_BW/usr/bin:$PATH"
    fi
    if ! bwrap --ro-bind / / --unshare-pid --unshare-net /bin/sh -c :; then
        echo "bwrap is unpacked in $KW_BW but cannot run here (user namespaces not allowed?); evaluations use --sandbox none" >&2
        return 1 2>/dev/null || exit 1
    fi
    echo "bwrap $(bwrap --version | cut -d' ' -f2) from $KW_BW"
fi
