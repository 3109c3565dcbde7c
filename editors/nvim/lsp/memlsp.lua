-- memlsp for Neovim 0.11+ (the `vim.lsp.config` form). With this directory on 'runtimepath':
--
--   vim.opt.rtp:append('/path/to/memlsp/editors/nvim')
--   vim.lsp.enable('memlsp')
--
-- Change anything with `vim.lsp.config('memlsp', { ... })`, for example
--   vim.lsp.config('memlsp', { settings = { memlsp = {
--     pathMappings = { ['/workspace/proj'] = '${workspaceFolder}' },  -- recorded prefix -> local path
--     captureGlobs = { '**/*.pickle', '**/*.xplane.pb' },
--     userFrameExcludes = { 'my_framework/' },
--     inlayHints = { enable = true, minPercent = 1 },
--     maxFileBytes = 4294967296,
--     topSites = 10,
--   } } })
-- The server scans and watches the workspace for captures itself: no client file watching needed.
-- `:MemlspTimeline` opens the memory timeline page of the capture behind the cursor's line.
return {
  cmd = { 'memlsp', 'lsp' },
  filetypes = { 'python' },
  root_markers = { 'pyproject.toml', 'setup.py', 'setup.cfg', 'requirements.txt', '.git' },
  -- The server reads these through `workspace/configuration` (section `memlsp`); keys left out
  -- keep the server's defaults.
  settings = {
    memlsp = {
      inlayHints = { enable = true },
    },
  },
  on_attach = function(client, bufnr)
    -- Inlay hints (`38% live memory`, `41% of heap peak`) are the point: shown by default.
    -- Set `vim.g.memlsp_inlay_hints = false` to leave them to your own config.
    if vim.g.memlsp_inlay_hints ~= false and client:supports_method('textDocument/inlayHint') then
      vim.lsp.inlay_hint.enable(true, { bufnr = bufnr })
    end
    -- :MemlspTimeline, the "Show memory timeline" code lenses (lua/memlsp/init.lua).
    require('memlsp').attach(client, bufnr)
  end,
}
