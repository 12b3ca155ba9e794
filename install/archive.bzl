"""zero_archive: one static archive holding the code of a set of cc_library targets.

Bazel 4.2.3 has no cc_static_library: this rule walks the deps' linking contexts, takes each
library's PIC archive (else its plain archive, else its object files), merges them with `ar -M`
into `<name>.a`, and writes every user link flag of those libraries (system libraries such as
-lgloo, CUDA's, in link order, duplicates dropped) to `<name>.flags`, one per line. tools/install.sh
installs both: the flags are what zero.pc and zeroConfig.cmake tell users to link. As a dependency
it provides those flags only (no code), for the cc_binary that makes libzero.so.
"""

def _zero_archive_impl(ctx):
    inputs = []
    objects = []
    flags = []
    for dep in ctx.attr.deps:
        for li in dep[CcInfo].linking_context.linker_inputs.to_list():
            for f in li.user_link_flags:
                if f not in flags:
                    flags.append(f)
            for lib in li.libraries:
                a = lib.pic_static_library or lib.static_library
                if a:
                    if a not in inputs:
                        inputs.append(a)
                else:
                    for o in (lib.pic_objects or lib.objects or []):
                        if o not in objects:
                            objects.append(o)
    out = ctx.outputs.archive
    flags_out = ctx.outputs.flags
    script = ["create " + out.path]
    script += ["addlib " + a.path for a in inputs]
    script += ["addmod " + o.path for o in objects]
    script += ["save", "end"]
    ctx.actions.run_shell(
        inputs = inputs + objects,
        outputs = [out],
        command = "printf '%s\\n' \"$@\" | ar -M && ranlib " + out.path,
        arguments = script,
        mnemonic = "ZeroArchive",
        progress_message = "Merging %d archives into %s" % (len(inputs), out.short_path),
    )
    ctx.actions.write(flags_out, "\n".join(flags) + "\n")
    # As a dependency it carries only the link flags (for the shared library, whose objects come
    # from the archive itself through cc_import).
    flags_only = cc_common.create_linking_context(linker_inputs = depset([
        cc_common.create_linker_input(owner = ctx.label, user_link_flags = depset(flags)),
    ]))
    return [
        DefaultInfo(files = depset([out, flags_out])),
        CcInfo(linking_context = flags_only),
    ]

zero_archive = rule(
    implementation = _zero_archive_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
    outputs = {"archive": "%{name}.a", "flags": "%{name}.flags"},
)
