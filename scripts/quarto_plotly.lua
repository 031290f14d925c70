-- plotly.js once per site, from the site: a Quarto filter (listed under `filters:` in _quarto.yml).
--
-- The book's figures are HTML outputs without plotly.js (smolfsdp.book.figures.plotting: a div and a script calling
-- Plotly.newPlot). On a page that has one, this filter adds plotly.js as a Quarto HTML dependency:
-- Quarto copies the file once into the site (site_libs/quarto-contrib/plotly-<version>/plotly.min.js) and
-- each such page loads it from there with a relative <script src> in its head, so the site works offline,
-- from a sub-path (GitHub Pages) and from file://. Quarto's own code for this:
--   quarto.doc.add_html_dependency  src/resources/pandoc/datadir/init.lua (paths relative to this script)
--   site_libs/quarto-contrib/<name>-<version>/  src/command/render/pandoc-dependencies-html.ts
--                                    (targetDirectoryInfo: "external" dependencies go to quarto-contrib)
-- plotly.min.js is not in the repository: `make render` (smolfsdp.book.chapters.prepare_render_project)
-- writes the installed plotly's copy beside this file in the scratch project, so it matches the figures.

local PLOTLYJS = "plotly.min.js"
local added = false

-- "4.1.1" from the licence header plotly.js starts with ("* plotly.js v4.1.1"); the dependency's folder
-- carries it, so a new plotly.js never meets a browser's cached old one.
local function plotly_version(path)
  local f = io.open(path, "r")
  if f == nil then
    error(path .. " is missing: render with `make render`, which writes plotly.min.js beside this filter")
  end
  local head = f:read(200) or ""
  f:close()
  return head:match("plotly%.js v([%d%.]+)") or "unknown"
end

local function add_plotly()
  local path = quarto.utils.resolve_path(PLOTLYJS)
  quarto.doc.add_html_dependency({
    name = "plotly",
    version = plotly_version(path),
    scripts = { PLOTLYJS },
  })
  added = true
end

return {
  {
    -- a figure reaches pandoc as a raw HTML block (Quarto wraps a text/html output in ```{=html}),
    -- inside the figure's float; Quarto's filters walk into custom nodes' content
    RawBlock = function(el)
      if not added and quarto.doc.is_format("html") and el.format:match("^html")
          and el.text:find('class="plotly-graph-div"', 1, true) then
        add_plotly()
      end
    end,
  },
}
