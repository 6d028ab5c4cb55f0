/* Plain C against the installed header and library. */
#include <stdio.h>
#include <string.h>

#include <kforge/runtime.h>

int main(void) {
  kf_runtime_options options;
  kf_runtime_options_init(&options);
  options.arch = "sm_90a";
  kf_runtime* rt = NULL;
  if (kf_runtime_create(&options, &rt) != KF_OK) {
    fprintf(stderr, "create: %s\n", kf_last_error());
    return 1;
  }
  kf_attention_args args;
  kf_attention_args_init(&args);
  kf_status s = kf_attention_forward(rt, &args);
  printf("abi %d, forward without sizes: %s (%s)\n", kf_runtime_abi_version(), kf_status_name(s),
         kf_last_error());
  kf_runtime_destroy(rt);
  return s == KF_ERR_INVALID_ARGUMENT && strstr(kf_last_error(), "args.batch") ? 0 : 1;
}
