"""Engine integrations on top of mlagen.serving; each imports its engine only when imported
itself (`import mlagen` never imports an engine).

  mlagen.integrations.vllm   the vLLM attention-backend plugin (pip install mlagen[vllm];
                             vllm serve ... --attention-backend CUSTOM)
"""
